"""The command line: the typer app and each verb's presentation."""
