"""Model providers: the model selection and provider registry, each provider's client and vocabulary, the scripted
model for tests, and the model call running in this task."""
