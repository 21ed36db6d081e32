"""Revision scripts, hand-written: each one spells out its tables and indexes explicitly."""
