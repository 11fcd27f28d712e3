#!/bin/bash
sed -i 's|return .*|return x > 0|' /app/*.py
