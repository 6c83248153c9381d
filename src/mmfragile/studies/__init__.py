"""End-to-end study runners: evaluation items, scoring and result loading for each study."""
