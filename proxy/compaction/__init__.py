"""The journey of one request (the pipeline), the compaction service it calls, and the runtime that holds them."""
