"""Model implementations over the paged attention backend, one file per family."""
