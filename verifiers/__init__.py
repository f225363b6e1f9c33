"""Verifiers: typed outcomes, math answers and sandboxed code execution."""
