"""Pictures of runs: timelines, memory plots, widgets."""
