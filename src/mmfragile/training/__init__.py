"""Training the embedded models (the zoo): scripts, not what a run imports."""
