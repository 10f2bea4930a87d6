"""The coordinator: sessions, rounds, aggregation, checkpoints, admin status."""
