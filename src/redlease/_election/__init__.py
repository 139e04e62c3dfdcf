"""Leader election: the election and its run loop, terms, the electors (threaded and asyncio),
fenced writes and pipelines. client-go's leaderelection is the model."""
