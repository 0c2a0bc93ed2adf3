"""The notebook side of the course: cells found, filled and loaded, and first-use costs paid ahead."""
