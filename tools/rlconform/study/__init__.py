"""Results studies: seeds x initial models x arms, run in parallel, summarised with paired bootstrap intervals."""
