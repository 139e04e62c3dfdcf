"""Locks: the lock and its store, the Redis and in-memory lockers, semaphores, fair queues,
the watchdog, holders, arguments, wait statistics, and the asyncio twins."""
