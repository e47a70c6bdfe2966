"""The code of the test-cluster scripts scripts/slurm-cluster, scripts/sge-cluster and scripts/k8s-cluster (each a
few lines that call main() of slurm.py, sge.py or k8s.py here): real Slurm, Son of Grid Engine and Kubernetes
clusters on this one machine, for tests and CI. common.py holds what all three share, netns.py the private network
of their multi-node clusters."""
