"""The session and its stores: the stored document, its receipts, journal and approvals, the store interface and
the memory, SQLite and DynamoDB stores that keep it."""
