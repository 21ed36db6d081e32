"""Switchyard's HTTP edge and orchestration."""
