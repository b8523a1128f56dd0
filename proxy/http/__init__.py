"""The server edge, the only code that imports aiohttp.web: routes, handlers, middleware and the relay of answers."""
