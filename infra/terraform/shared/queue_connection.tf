# The queue's connection as its clients take it (module.queue's `connection` output). One
# declaration for every module that reaches the queue: each links this file into its folder.

variable "redis" {
  description = "The queue as its clients reach it: host, port, its security group (egress target) and the secret holding its auth token."
  type = object({
    host              = string
    port              = number
    security_group_id = string
    auth_secret_arn   = string
  })
}
