"""The AI SDK's ``useChat`` beside the native protocol (docs/protocol.md §14, "The AI SDK")."""
