// The real node's pause program (the pod sandbox's first process): ours, a few lines, no dependency.
// Test infrastructure only: nothing here is shipped. Built by tests/realnode/build.py.
module rl-batch-demo.test/realnode/pause

go 1.26.0
