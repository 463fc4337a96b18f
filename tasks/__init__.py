"""Prefect tasks: thin units that call the libraries and log to MLflow (through store/tracking.py).

The Prefect defaults every entry point needs are set by the import root (stagewise/__init__.py).
"""
