"""The real-node tier: a Kubernetes node's own programs built from their Go modules and its images
made from Debian's packages (build.py), a node a test starts and stops beside the real control
plane's kwok nodes (node.py, nodeinit.py), and the registry it pulls from (node.Registry)."""
