"""What the tests share, one module per concern; tests/conftest.py turns them into fixtures.

- `workspace`: a test's directory and database, and driving the real CLI in it;
- `postgres`: the PostgreSQL server the `[postgres]` variants use, a schema per test;
- `smtp`: real SMTP servers on 127.0.0.1 (an inbox, a slow relay);
- `net`: free ports on 127.0.0.1 for the servers a test starts;
- `runs`: runs built directly in the store, planned or half sent, for tests whose subject
  comes after the sending;
- `scripted_http`: a webhook receiver whose every answer, per key, is scripted byte for byte;
- `halts`: a batch sent to a downstream that leaves every item unknown, resumed through the
  halts that makes;
- `held`: the real Runner in-process against a channel whose requests wait for the test,
  its committer held if need be, for tests of what the senders do meanwhile;
- `waits`: the test switch that scales notifier's waits (notifier/domain/waits.py).
"""
