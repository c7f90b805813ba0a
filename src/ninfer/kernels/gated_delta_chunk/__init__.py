"""Chunked (WY / UT-transform) gated delta rule for prefill on tensor cores (launcher and twin)."""
