"""Tests of proxy/core, a file per module."""
