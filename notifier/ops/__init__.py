"""What an operator does around a run: approval, manual reconciliation, reports,
suppression, preview, and who is at the keyboard."""
