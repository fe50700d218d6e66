#!/usr/bin/env bash
# Build the project's image and push it to the cluster's ECR repository.
#
#   scripts/push-image.sh [REPOSITORY_URL] [TAG]
#
# REPOSITORY_URL  e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/pipeline.
#                 Default: `terraform output -raw ecr_repository_url`, run in
#                 $TF_DIR (default: terraform/examples/minimal, or the current
#                 directory if it holds a Terraform state).
# TAG             Default: the git commit (short), with -dirty-<timestamp>
#                 appended when the work tree has uncommitted changes. The
#                 repository's tags are immutable: every build gets its own.
#
# Prints the tag, and the terraform apply that rolls it out, at the end.
# Needs: docker, the AWS CLI (credentials allowed to push to the repository),
# git, and terraform when REPOSITORY_URL is not given.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

repository_url=${1:-}
tag=${2:-${IMAGE_TAG:-}}

if [[ -z "$repository_url" ]]; then
  if [[ -n "${TF_DIR:-}" ]]; then
    tf_dir=$TF_DIR
  elif [[ -f terraform.tfstate || -d .terraform ]]; then
    tf_dir=$PWD
  else
    tf_dir=$repo_root/terraform/examples/minimal
  fi
  repository_url=$(terraform -chdir="$tf_dir" output -raw ecr_repository_url)
fi

if [[ ! "$repository_url" =~ ^([0-9]{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?/[a-z0-9._/-]+$ ]]; then
  echo "push-image: not an ECR repository URL: '$repository_url'" >&2
  exit 2
fi
registry=${repository_url%%/*}
region=${BASH_REMATCH[2]}

if [[ -z "$tag" ]]; then
  tag=$(git -C "$repo_root" rev-parse --short=12 HEAD)
  if [[ -n "$(git -C "$repo_root" status --porcelain --untracked-files=no)" ]]; then
    tag="$tag-dirty-$(date -u +%Y%m%d%H%M%S)"
  fi
fi

echo "push-image: building pipeline:latest from $repo_root"
docker build -t pipeline:latest "$repo_root"

echo "push-image: logging in to $registry"
aws ecr get-login-password --region "$region" |
  docker login --username AWS --password-stdin "$registry"

docker tag pipeline:latest "$repository_url:$tag"
docker push "$repository_url:$tag"

cat <<EOF

Pushed $repository_url:$tag
Roll it out:
  terraform apply -var image_tag=$tag
(new instances run it; replace running ones with:
  aws autoscaling start-instance-refresh --region $region --auto-scaling-group-name <worker_asg_name>)
EOF
