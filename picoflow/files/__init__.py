"""Files in a conversation: references stored in messages, the upload policy, and the stores that keep the bytes."""
