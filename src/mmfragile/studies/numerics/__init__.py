"""Study 4 - the noise floor: what an answer does when only the arithmetic changes (precision, batch size and
composition, path, threads, attention), so that every other study's effect can be held against it."""
