"""Locked-down Docker sandbox: image, warm pool, in-container worker, HTTP service, client."""
