"""Tests of proxy/summarizer, a file per module."""
