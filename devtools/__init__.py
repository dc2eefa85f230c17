"""Development tools, outside the product package and image: local broker and registry, demo,
benchmark, sample receiver and producer."""
