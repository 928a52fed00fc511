#!/bin/bash
set -e
touch /app/done
