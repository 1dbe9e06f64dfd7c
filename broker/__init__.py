"""The core every role shares: what requests, decisions and runs are, how they are kept in
Redis, the one judge of a decision, and the face the roles and the channels call
(`broker.facade.Broker`)."""
