"""The client APIs the proxy speaks, each read into the proxy's view of a conversation and written back."""
