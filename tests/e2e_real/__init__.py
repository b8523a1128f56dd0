"""End-to-end tests of the proxy in front of a real llama.cpp model server."""
