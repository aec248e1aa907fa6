"""Multi-turn episodes: the driver, tools and environments, tool-call formats, environment workers."""
