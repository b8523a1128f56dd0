"""Tests of proxy/upstream, a file per module."""
