"""The client side: requests to the upstream, their answers and streams, overflow detection, context windows."""
