"""AI-infrastructure lab framework: manifest, pytest plugin, grading, CLI."""
