"""Test-only support code (fault injection, shared helpers). The product never imports it."""
