"""Tests of proxy/http, a file per module."""
