"""The real-control-plane tier: upstream programs built from their Go modules (build.py), a control
plane a test starts and stops (cluster.py), the episode runtime for kwok's nodes (runtime.py)."""
