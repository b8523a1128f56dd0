"""End to end: the real app on 127.0.0.1 between real clients (the official SDKs) and fake upstreams."""
