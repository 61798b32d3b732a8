"""`pcrfs csi`: a Kubernetes CSI node plugin (plugin.py) over the messages of csi.proto,
which the build compiles to csi_pb2 / csi_pb2_grpc."""
