"""Sessions on one machine: the registry directory, serve, fork, the socket client,
asks and answers, reports. Nothing here knows what a harness is: a harness is whatever
process holds the other end of ``melchior serve``'s pipes."""
