"""What a corpus holds: one parallel scan, `corpus report`, `corpus count`, scripts, costs."""
