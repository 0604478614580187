"""Stage 2, the ssh session and the Monarch workers: pre-flight, environment over ssh, one
worker per host through sshd, attach, teardown, exit records; Monarch's private APIs in
monarch_compat."""
