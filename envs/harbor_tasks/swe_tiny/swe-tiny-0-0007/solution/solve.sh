#!/bin/bash
sed -i 's|return .*|return xs[:-1]|' /app/*.py
