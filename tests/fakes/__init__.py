"""Fakes of external services that tests run against over real sockets."""
