"""The REST API (faces only: views validate and call domain services)."""
