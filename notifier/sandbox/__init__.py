"""A local HTTP notification provider with seeded fault injection, for rehearsals and tests."""
