"""The local adapter: the picoflow command (serve, chat, demo, eval, new, erase), the chat page and inspector, and
the scaffold of a new project."""
