"""One seam per external system: Kubernetes, S3, PostgreSQL admin, HTTP, secret references."""
