"""What runs inside each rank: the training entry point, models, timers and compressors."""
