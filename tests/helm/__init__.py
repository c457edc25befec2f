"""Tests of the Helm chart (helm/ebbtide): rendered with the real Helm engine, no helm binary."""
