module switchyard.dev/e2e/nvml-mock/gocheck

go 1.25

require github.com/NVIDIA/go-nvml v0.13.4-1
