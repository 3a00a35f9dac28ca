"""What is sent: the batch CSV, templates, Claude drafting (Messages and Batches), the
schedule and send windows, one-click unsubscribe, and the plan of frozen intents."""
