"""HTTP delivery: the lean client, the resolver under the outbound policy, the sender."""
